// A small flag parser shared by every subcommand: declared flags, generated --help,
// and errors that name the flag.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hetrain::cli {

class ArgParser {
 public:
  ArgParser(std::string command, std::string summary);
  /// A flag taking a value: --name VALUE or --name=VALUE.
  ArgParser& option(const std::string& name, const std::string& metavar, const std::string& help,
                    std::optional<std::string> default_value = std::nullopt);
  /// A boolean flag: --name.
  ArgParser& flag(const std::string& name, const std::string& help);
  /// Extra text printed after the flag list (examples).
  ArgParser& epilog(const std::string& text);
  /// Parses args (without the program and subcommand names). Throws Error on an unknown
  /// flag or a missing value. Returns false when --help was printed.
  bool parse(const std::vector<std::string>& args);
  std::string help() const;
  /// The subcommand, as errors name it: "[profile] ...".
  const std::string& command() const { return command_; }

  bool has(const std::string& name) const;    // given on the command line or has a default
  bool given(const std::string& name) const;  // given on the command line
  std::string get(const std::string& name) const;
  /// Parsed numbers; the error names the flag and the bad text.
  long long get_int(const std::string& name) const;
  double get_double(const std::string& name) const;
  bool get_flag(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  struct Spec {
    std::string metavar, help;
    std::optional<std::string> def;
    bool is_flag = false;
  };
  std::string command_, summary_, epilog_;
  std::vector<std::string> order_;
  std::map<std::string, Spec> specs_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace hetrain::cli
