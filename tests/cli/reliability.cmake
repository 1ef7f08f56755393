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
# plan: rates above the device's peak (an MFU over 100%), durations and costs past any run.
set(HT_PLAN_H100 plan --preset gpt2-124m --hardware h100-sxm --gpus 8 --tp 1 --pp 1 --zero 0
    --offload none --recompute none --micro-batch 8)
hetrain_cli_test(cli.bad.plan_mfu_over_100 "--achieved-tflops 100000 exceeds 'h100-sxm''s bf16 peak of 989.4 TFLOP/s"
                 ${HT} ${HT_PLAN_H100} --achieved-tflops 1e5)
hetrain_cli_test(cli.bad.plan_kernel_rate "--kernel-tflops 1e\\+09 exceeds 'h100-sxm''s bf16 peak"
                 ${HT} ${HT_PLAN_H100} --kernel-tflops 1e9)
hetrain_cli_test(cli.bad.plan_tokens "--tokens must be at most 1e18, got '1e300'"
                 ${HT} ${HT_PLAN_H100} --tokens 1e300)
hetrain_cli_test(cli.bad.plan_price "--price is per device-hour: at most 1e6, got '1e300'"
                 ${HT} ${HT_PLAN_H100} --price 1e300)
# Catalog, measured-runs and perf-model files: absurd figures, directories and numbers past a
# double's range are errors naming the file (and the entry and field).
set(HT_BAD ${CMAKE_CURRENT_SOURCE_DIR}/cli/bad)
hetrain_cli_test(cli.bad.catalog_link0 "catalog_link0.json: hardware 'h100-sxm': link.gbs must be positive"
                 ${HT} plan --preset gpt2-124m --catalog ${HT_BAD}/catalog_link0.json)
hetrain_cli_test(cli.bad.catalog_dir "hardware catalog '.*/cli/bad': is a directory"
                 ${HT} plan --preset gpt2-124m --catalog ${HT_BAD})
hetrain_cli_test(cli.bad.catalog_1e400 "hardware catalog '.*catalog_1e400.json' is not valid JSON: .*number overflow"
                 ${HT} plan --preset gpt2-124m --catalog ${HT_BAD}/catalog_1e400.json)
hetrain_cli_test(cli.bad.measured_gpus0 "measured_gpus0.json: runs\\[0\\]: 'gpus' must be an integer in \\[1, 1000000\\], got 0"
                 ${HT} plan --preset gpt2-124m --measured ${HT_BAD}/measured_gpus0.json)
hetrain_cli_test(cli.bad.measured_strategy "measured run .*measured_tp.json: runs\\[0\\] \\(hardware 'h100-sxm', gpus 2, tp=5 .*\\): --gpus 2 is not divisible by tp x pp = 5 x 1"
                 ${HT} plan --preset gpt2-124m --measured ${HT_BAD}/measured_tp.json)
hetrain_cli_test(cli.bad.measured_dir "measured-runs file '.*/cli/bad': is a directory"
                 ${HT} plan --preset gpt2-124m --measured ${HT_BAD})
hetrain_cli_test(cli.bad.measured_1e400 "measured-runs file '.*measured_1e400.json' is not valid JSON: .*number overflow"
                 ${HT} plan --preset gpt2-124m --measured ${HT_BAD}/measured_1e400.json)
hetrain_cli_test(cli.bad.perfmodel_dir "performance models '.*/cli/bad': is a directory"
                 ${HT} perfmodel show --file ${HT_BAD})
# Crash consistency: 24 kills at pseudo-random moments (seeded) of a run saving every step.
add_test(NAME cli.crash_consistency
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/crash_consistency.sh ${HT} 24 28)
set_tests_properties(cli.crash_consistency PROPERTIES TIMEOUT 600 LABELS slow)
