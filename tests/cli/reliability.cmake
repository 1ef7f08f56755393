# Reliability tests (docs/RELIABILITY.md), included from cli_tests.cmake (HT, hetrain_cli_test).
# Checkpoints survive a full disk or a kill mid-save.
add_test(NAME cli.checkpoint_atomic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/checkpoint_atomic.sh ${HT})
set_tests_properties(cli.checkpoint_atomic PROPERTIES TIMEOUT 300)
# Output files: symlinks, FIFOs, devices, --json-log on bad input and full disks, NaN losses.
add_test(NAME cli.output_files COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/output_files.sh ${HT})
set_tests_properties(cli.output_files PROPERTIES TIMEOUT 300)
# Bad input is refused at the door, naming the flag, key or file (issue 28, defects 8-10).
set(HT_MLP train --preset fashion-mlp --hidden 8 --batch-size 8 --no-progress --no-record)
hetrain_cli_test(cli.bad.min_lr "min-lr must be >= 0, got -1" ${HT} ${HT_MLP} --min-lr -1)
hetrain_cli_test(cli.bad.momentum "momentum must be in \\[0, 1\\), got 2" ${HT} ${HT_MLP} --momentum 2)
hetrain_cli_test(cli.bad.clip_nan "flag --clip: 'clip' expects a finite number, got 'nan'"
                 ${HT} ${HT_MLP} --clip nan)
hetrain_cli_test(cli.bad.lr_inf "flag --lr: 'lr' expects a finite number, got 'inf'" ${HT} ${HT_MLP} --lr inf)
hetrain_cli_test(cli.bad.steps_zero "flag --steps: 'steps' must be at least 1, got 0"
                 ${HT} ${HT_MLP} --steps 0)
hetrain_cli_test(cli.bad.toml_lr_list "lr_list.toml: 'lr' must be a single value, not a list"
                 ${HT} ${HT_MLP} --config ${CMAKE_CURRENT_SOURCE_DIR}/cli/bad/lr_list.toml)
hetrain_cli_test(cli.bad.toml_lr_bool "lr_bool.toml: 'lr' must not be a boolean"
                 ${HT} ${HT_MLP} --config ${CMAKE_CURRENT_SOURCE_DIR}/cli/bad/lr_bool.toml)
hetrain_cli_test(cli.bad.toml_steps_bool "steps_bool.toml: 'steps' must not be a boolean"
                 ${HT} ${HT_MLP} --config ${CMAKE_CURRENT_SOURCE_DIR}/cli/bad/steps_bool.toml)
hetrain_cli_test(cli.bad.config_dir "config .*/cli/bad: not a regular file"
                 ${HT} ${HT_MLP} --config ${CMAKE_CURRENT_SOURCE_DIR}/cli/bad)
hetrain_cli_test(cli.bad.threads_wrap "threads must be between 0 \\(one per core\\) and [0-9]+.*got 4294967297"
                 ${HT} ${HT_MLP} --threads 4294967297)
hetrain_cli_test(cli.bad.threads_huge "threads must be between 0 \\(one per core\\) and [0-9]+.*got 1000000"
                 ${HT} ${HT_MLP} --threads 1000000)
# Divergence: a run that is not training stops with an error saying so.
hetrain_cli_test(cli.bad.diverged_loss "the loss diverged at step [0-9]+: .*--divergence-factor"
                 ${HT} ${HT_MLP} --steps 30 --lr 1 --divergence-factor 2)
hetrain_cli_test(cli.bad.skipped_in_a_row "5 steps in a row \\(to step 5\\) were skipped .*--divergence-steps"
                 ${HT} train ${HT_TINY_GPT} --steps 20 --precision fp16 --loss-scale 1e12
                 --loss-scale-floor 0 --divergence-steps 5)
# plan: counts that would wrap, NaN and overflowing sizes.
hetrain_cli_test(cli.bad.plan_gpus "--gpus expects a positive integer up to 1e\\+06, got '5e9'"
                 ${HT} plan --preset gpt2-124m --gpus 5e9)
hetrain_cli_test(cli.bad.plan_deadline_nan "--deadline expects a finite number, got 'nan'"
                 ${HT} plan --preset gpt2-124m --deadline nan)
hetrain_cli_test(cli.bad.plan_overflow "parameter count overflows 64-bit integers"
                 ${HT} plan --model gpt --layers 1000000000 --hidden 1000000000 --heads 1 --seq 1024
                 --vocab 50257)
# Data: a device (would never end), a binary file (would be trained on as bytes).
hetrain_cli_test(cli.bad.data_device "text corpus /dev/zero: not a regular file or a directory"
                 ${HT} train ${HT_TINY_GPT} --steps 1 --data /dev/zero)
hetrain_cli_test(cli.bad.data_binary "text corpus .*hetrain: does not look like text"
                 ${HT} train ${HT_TINY_GPT} --steps 1 --data ${HT})
