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
