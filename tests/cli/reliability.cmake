# Reliability tests (docs/RELIABILITY.md), included from cli_tests.cmake (HT, hetrain_cli_test).
# Checkpoints survive a full disk or a kill mid-save.
add_test(NAME cli.checkpoint_atomic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/checkpoint_atomic.sh ${HT})
set_tests_properties(cli.checkpoint_atomic PROPERTIES TIMEOUT 300)
# Output files: symlinks, FIFOs, devices, --json-log on bad input and full disks, NaN losses.
add_test(NAME cli.output_files COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/output_files.sh ${HT})
set_tests_properties(cli.output_files PROPERTIES TIMEOUT 300)
