# Multi-process tests: ctest launches mpirun itself (tests/distributed/mpirun.sh).
set(HT_MPIRUN bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/mpirun.sh)
foreach(np 2 4)
  add_test(NAME distributed.collectives_np${np}
           COMMAND ${HT_MPIRUN} ${np} 120 $<TARGET_FILE:test_distributed> --gtest_filter=World.*)
  set_tests_properties(distributed.collectives_np${np} PROPERTIES TIMEOUT 180)
endforeach()
# The same over Open MPI's TCP transport, as between machines.
add_test(NAME distributed.collectives_tcp_np2
         COMMAND ${HT_MPIRUN} 2 120 --mca btl tcp,self -- $<TARGET_FILE:test_distributed>
                 --gtest_filter=World.*)
set_tests_properties(distributed.collectives_tcp_np2 PROPERTIES TIMEOUT 180)
# DDP equals gradient accumulation, bit for bit, for every bucket size.
set(HT_DDP_MLP --preset fashion-mlp --hidden 64,32 --batch-size 32 --steps 20 --clip 1)
set(HT_DDP_GPT --preset gpt-mini --layers 1 --width 32 --heads 2 --context 16 --batch-size 8
    --steps 20 --eval-batches 2)
foreach(np 2 4)
  add_test(NAME distributed.ddp_equals_accum_mlp_np${np}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/ddp_equal.sh $<TARGET_FILE:hetrain>
                   ${np} ${HT_DDP_MLP})
  add_test(NAME distributed.ddp_equals_accum_gpt_np${np}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/ddp_equal.sh $<TARGET_FILE:hetrain>
                   ${np} ${HT_DDP_GPT})
  add_test(NAME distributed.ddp_equals_accum_gpt_np${np}_small_buckets
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/ddp_equal.sh $<TARGET_FILE:hetrain>
                   ${np} ${HT_DDP_GPT} --bucket-mb 0.01)
  set_tests_properties(distributed.ddp_equals_accum_mlp_np${np} distributed.ddp_equals_accum_gpt_np${np}
                       distributed.ddp_equals_accum_gpt_np${np}_small_buckets
                       PROPERTIES TIMEOUT 600 PASS_REGULAR_EXPRESSION "DDP -np ${np} equals")
endforeach()
# A rank that exits, aborts, crashes or hangs: mpirun returns non-zero in time, nothing left.
foreach(kind exit abort segv hang)
  add_test(NAME distributed.rank_failure_${kind}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/failure.sh $<TARGET_FILE:hetrain>
                   ${kind})
  set_tests_properties(distributed.rank_failure_${kind} PROPERTIES TIMEOUT 180
                       PASS_REGULAR_EXPRESSION "rank failure \\(${kind}\\) handled")
endforeach()
# hetrain topo: the machine from hwloc, and under mpirun each rank's CPUs and threads.
add_test(NAME distributed.topo COMMAND $<TARGET_FILE:hetrain> topo)
set_tests_properties(distributed.topo PROPERTIES
                     PASS_REGULAR_EXPRESSION "package\\(s\\), [0-9]+ cores.*NUMA node 0: CPUs.*rank 0 \\(local 0\\)")
add_test(NAME distributed.topo_np2
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/topo_np2.sh $<TARGET_FILE:hetrain>)
set_tests_properties(distributed.topo_np2 PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77
                     PASS_REGULAR_EXPRESSION "topo: 2 ranks, one CPU and one thread each")
# bench --comm over 2 ranks: every collective and the trainer's reduction up to 4 MiB.
add_test(NAME distributed.bench_comm_np2
         COMMAND ${HT_MPIRUN} 2 120 $<TARGET_FILE:hetrain> bench --comm --quick)
set_tests_properties(distributed.bench_comm_np2 PROPERTIES TIMEOUT 180 PASS_REGULAR_EXPRESSION
  "over 2 rank\\(s\\) \\(mpi\\).*all_reduce +1024 .*ddp_fixed_order +4194304 +[0-9.]+ +[0-9.]+ +[0-9.]+")
