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
# The progress mode (HETRAIN_DDP_PROGRESS) changes when a bucket is summed, never the bits: the
# many-bucket run under a communication thread, and with no progress until reduce().
foreach(mode thread none)
  foreach(np 2 4)
    add_test(NAME distributed.ddp_equals_accum_gpt_np${np}_small_buckets_${mode}_progress
             COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/ddp_equal.sh $<TARGET_FILE:hetrain>
                     ${np} ${HT_DDP_GPT} --bucket-mb 0.01)
    set_tests_properties(distributed.ddp_equals_accum_gpt_np${np}_small_buckets_${mode}_progress
                         PROPERTIES TIMEOUT 600 ENVIRONMENT "HETRAIN_DDP_PROGRESS=${mode}"
                         PASS_REGULAR_EXPRESSION "DDP -np ${np} equals")
  endforeach()
endforeach()
# fashion-cnn under DDP: BatchNorm statistics per rank (PyTorch DDP's default), so the
# parameters, optimizer state and losses equal --grad-accum bit for bit and rank 0's running
# statistics are its own micro-batches' (ddp_equal.sh --bn-per-rank).
add_test(NAME distributed.ddp_equals_accum_cnn_np2
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/ddp_equal.sh $<TARGET_FILE:hetrain> 2
                 --bn-per-rank --preset fashion-cnn --widths 4,8 --batch-size 32 --steps 10)
set_tests_properties(distributed.ddp_equals_accum_cnn_np2 PROPERTIES TIMEOUT 600
                     PASS_REGULAR_EXPRESSION "BatchNorm per rank.*DDP -np 2 equals")
# --resume under mpirun: a run cut off after its step-10 checkpoint, resumed on 2 ranks, ends
# byte-identical to the uninterrupted 2-rank run and to --grad-accum 2 (ddp_resume.sh).
set(HT_RESUME_MLP --preset fashion-mlp --hidden 64,32 --batch-size 32 --clip 1)
set(HT_RESUME_GPT --preset gpt-mini --layers 1 --width 32 --heads 2 --context 16 --batch-size 8
    --eval-batches 2 --bucket-mb 0.01)
foreach(model MLP GPT)
  string(TOLOWER ${model} name)
  add_test(NAME distributed.ddp_resume_${name}_np2
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/ddp_resume.sh $<TARGET_FILE:hetrain>
                   2 10 ${HT_RESUME_${model}})
  set_tests_properties(distributed.ddp_resume_${name}_np2 PROPERTIES TIMEOUT 600
                       PASS_REGULAR_EXPRESSION "DDP -np 2 resumed at step 10 equals")
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
# A stand-in NVML (two GPUs joined by NVLink) for load_gpu_topology's dlopen path without a GPU.
enable_language(C)
add_library(fake_nvml SHARED ${CMAKE_CURRENT_SOURCE_DIR}/distributed/fake_nvml.c)
add_dependencies(test_distributed fake_nvml)
target_compile_definitions(test_distributed PRIVATE
                           HETRAIN_FAKE_NVML="$<TARGET_FILE:fake_nvml>")
# hetrain topo over the stand-in: the GPUs and the pair matrix in text.
add_test(NAME distributed.topo_fake_nvml COMMAND $<TARGET_FILE:hetrain> topo)
set_tests_properties(distributed.topo_fake_nvml PROPERTIES
                     ENVIRONMENT "HETRAIN_NVML_LIBRARY=$<TARGET_FILE:fake_nvml>"
                     PASS_REGULAR_EXPRESSION "2 NVLink link\\(s\\) up.*GPU0  X     NV2")
# Without NVML (the library named by HETRAIN_NVML_LIBRARY is missing) topo warns and succeeds.
add_test(NAME distributed.topo_no_nvml COMMAND $<TARGET_FILE:hetrain> topo --json)
set_tests_properties(distributed.topo_no_nvml PROPERTIES
                     ENVIRONMENT "HETRAIN_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1"
                     PASS_REGULAR_EXPRESSION "no NVML \\(/nonexistent/libnvidia-ml.so.1\\)")
add_test(NAME distributed.topo_np2
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/topo_np2.sh $<TARGET_FILE:hetrain>)
set_tests_properties(distributed.topo_np2 PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77
                     PASS_REGULAR_EXPRESSION "topo: 2 ranks, one CPU and one thread each")
# bench --comm over 2 ranks: every collective and the trainer's reduction up to 4 MiB.
add_test(NAME distributed.bench_comm_np2
         COMMAND ${HT_MPIRUN} 2 120 $<TARGET_FILE:hetrain> bench --comm --quick)
set_tests_properties(distributed.bench_comm_np2 PROPERTIES TIMEOUT 180 PASS_REGULAR_EXPRESSION
  "over 2 rank\\(s\\) \\(mpi\\).*all_reduce +1024 .*ddp_fixed_order +4194304 +[0-9.]+ +[0-9.]+ +[0-9.]+")
# bench --comm's table stored in the device profile (kept by hetrain bench), and simulate
# --ranks / plan --hardware local --gpus read it: known timings give the formula's result.
add_test(NAME distributed.comm_profile
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/comm_profile.sh $<TARGET_FILE:hetrain>)
set_tests_properties(distributed.comm_profile PROPERTIES TIMEOUT 400 PASS_REGULAR_EXPRESSION
                     "DDP step predicted from the device profile's collective timings")
# ZeRO stages 1, 2 and 3 equal stage 0 bit for bit (model, optimizer state, losses), and each
# rank's model-state bytes equal the formulas (tests/distributed/zero_equal.sh).
foreach(np 2 4)
  add_test(NAME distributed.zero_equal_mlp_np${np}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/zero_equal.sh $<TARGET_FILE:hetrain>
                   ${np} ${HT_DDP_MLP})
  add_test(NAME distributed.zero_equal_gpt_np${np}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/zero_equal.sh $<TARGET_FILE:hetrain>
                   ${np} ${HT_DDP_GPT} --clip 0.5 --bucket-mb 0.01)
  set_tests_properties(distributed.zero_equal_mlp_np${np} distributed.zero_equal_gpt_np${np}
                       PROPERTIES TIMEOUT 600 PASS_REGULAR_EXPRESSION "ZeRO -np ${np}: stages 1, 2 and 3 equal")
endforeach()
# ZeRO's bad input: a stage out of range.
add_test(NAME distributed.zero_bad_stage COMMAND $<TARGET_FILE:hetrain> train --zero 4)
set_tests_properties(distributed.zero_bad_stage PROPERTIES
                     PASS_REGULAR_EXPRESSION "zero must be 0, 1, 2 or 3 \\(the ZeRO stage\\), got '4'")
# --param-persistence-threshold only means something under stage 3.
add_test(NAME distributed.zero_persistence_needs_stage3
         COMMAND $<TARGET_FILE:hetrain> train --zero 2 --param-persistence-threshold 64)
set_tests_properties(distributed.zero_persistence_needs_stage3 PROPERTIES PASS_REGULAR_EXPRESSION
                     "param-persistence-threshold keeps small parameters whole under --zero 3; this run has --zero 2")
# fp16 with dynamic loss scaling under stages 1, 2 and 3: every rank checks its own gradient shard
# for inf/NaN and the answers are all-reduced, so all ranks skip the same steps; an initial
# scale of 1e9 overflows the first steps (skipped, the scale backs off) and the rest train.
foreach(np 2 4)
  add_test(NAME distributed.zero_equal_fp16_np${np}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/zero_equal.sh $<TARGET_FILE:hetrain>
                   ${np} ${HT_DDP_MLP} --precision fp16 --loss-scale 1e9)
  set_tests_properties(distributed.zero_equal_fp16_np${np} PROPERTIES TIMEOUT 600
                       PASS_REGULAR_EXPRESSION "ZeRO -np ${np}: stages 1, 2 and 3 equal.*skipped steps: [1-9]")
endforeach()
# The planner's per-device model states against the allocator's, gpt-mini, stages 0-3.
foreach(np 2 4)
  add_test(NAME distributed.zero_plan_np${np}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/zero_plan.sh $<TARGET_FILE:hetrain> ${np})
  set_tests_properties(distributed.zero_plan_np${np} PROPERTIES TIMEOUT 600
                       PASS_REGULAR_EXPRESSION "ZeRO -np ${np}: model states within 3% of the plan")
endforeach()
# ZeRO on a sim state device (tests/distributed/zero_offload.sh): stages 1-2 with --offload
# optimizer and stage 3 with --offload optimizer+params keep the offloaded state on the host and
# equal zero 0 bitwise (stages 1-2 also without clipping, where each bucket's update streams);
# a capacity-limited sim:0 is out of memory without offload and fits with.
add_test(NAME distributed.zero_offload_np2
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/zero_offload.sh $<TARGET_FILE:hetrain>)
set_tests_properties(distributed.zero_offload_np2 PROPERTIES TIMEOUT 600 PASS_REGULAR_EXPRESSION
                     "zero offload -np 2: .*streamed.* fit only the offloaded run")
# The planner's Hetrain-engine layout under offload (tests/distributed/zero_offload_plan.sh):
# model states on sim:0 and on the host within 3% of the plan, the device peak within 10%.
foreach(np 2 4)
  add_test(NAME distributed.zero_offload_plan_np${np}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/zero_offload_plan.sh
                   $<TARGET_FILE:hetrain> ${np})
  set_tests_properties(distributed.zero_offload_plan_np${np} PROPERTIES TIMEOUT 600
                       PASS_REGULAR_EXPRESSION
                       "ZeRO offload -np ${np}: device and host model states within 3% of the plan")
endforeach()
# Resharding checkpoints (tests/distributed/zero_reshard.sh): saved at step 10 on 4 ranks under
# --zero 1, 2 and 3 (a shard per rank), consolidated equal to zero 0's plain files, loaded on 2
# ranks and on 1 process bitwise, resumed on 1 process to the 4-rank run's end.
add_test(NAME distributed.zero_reshard_mlp
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/zero_reshard.sh $<TARGET_FILE:hetrain>
                 ${HT_DDP_MLP})
add_test(NAME distributed.zero_reshard_gpt
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/zero_reshard.sh $<TARGET_FILE:hetrain>
                 ${HT_DDP_GPT} --bucket-mb 0.01)
set_tests_properties(distributed.zero_reshard_mlp distributed.zero_reshard_gpt PROPERTIES
                     TIMEOUT 900 PASS_REGULAR_EXPRESSION "saved on 4 ranks, loaded on 2 and 1, bitwise")
# Broken shard sets (missing, extra, truncated, foreign) refused by every reader, naming the file.
add_test(NAME distributed.zero_broken_shards
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/zero_broken.sh $<TARGET_FILE:hetrain>)
set_tests_properties(distributed.zero_broken_shards PROPERTIES TIMEOUT 300
                     PASS_REGULAR_EXPRESSION "broken shard sets refused by name")
# A rank SIGKILLed while a sharded checkpoint is written: the previous one stays loadable, the
# new one is complete or rejected, and the resumed runs end as the uninterrupted one.
add_test(NAME distributed.zero_kill_during_save
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/zero_kill.sh $<TARGET_FILE:hetrain>)
set_tests_properties(distributed.zero_kill_during_save PROPERTIES TIMEOUT 600
                     PASS_REGULAR_EXPRESSION "previous checkpoint kept, new one complete or rejected")
# DDP with a sim device beside the CPU equals DDP on the CPU alone, in bf16, whose casts of the
# parameters the scheduler places on sim:0: their copies there follow each update.
add_test(NAME distributed.ddp_sim_device_equals_cpu_bf16_np2
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/ddp_devices.sh $<TARGET_FILE:hetrain>
                 2 --preset gpt-mini --layers 1 --width 32 --heads 2 --context 16 --batch-size 8
                 --steps 4 --eval-batches 2 --precision bf16)
set_tests_properties(distributed.ddp_sim_device_equals_cpu_bf16_np2 PROPERTIES TIMEOUT 600
                     PASS_REGULAR_EXPRESSION "DDP -np 2 on cpu,sim:0 equals cpu")
# Every test of this file runs Open MPI (mpirun, or MPI_Init as a singleton): label `mpi`.
# The sanitizer job (tools/run_sanitizers.sh) runs these without LeakSanitizer, which cannot
# name the allocations Open MPI's dlopen'ed components leave at exit (see that script).
get_property(ht_all_tests DIRECTORY PROPERTY TESTS)
foreach(t IN LISTS ht_all_tests)
  if(t MATCHES "^distributed\\.")
    set_property(TEST ${t} APPEND PROPERTY LABELS mpi)
  endif()
endforeach()
