// Token shards (HTOK: magic, version, count, uint16 tokens) read for a GPT-2-sized vocabulary.
#include "fuzz_common.h"
#include "hetrain/training/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hetrain::fuzz::write_input(data, size, "tokens.bin");
  hetrain::fuzz::expect_only_errors(
      [&] { (void)hetrain::data::load_token_shard(path, 50257); });
  return 0;
}
