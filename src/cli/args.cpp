#include "cli/args.h"

#include <cmath>
#include <iostream>
#include <sstream>

#include "hetrain/base/error.h"

namespace hetrain::cli {

ArgParser::ArgParser(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {
  flag("help", "show this help and exit");
}

ArgParser& ArgParser::option(const std::string& name, const std::string& metavar,
                             const std::string& help, std::optional<std::string> def) {
  order_.push_back(name);
  specs_[name] = Spec{metavar, help, std::move(def), false};
  return *this;
}

ArgParser& ArgParser::flag(const std::string& name, const std::string& help) {
  order_.push_back(name);
  specs_[name] = Spec{"", help, std::nullopt, true};
  return *this;
}

ArgParser& ArgParser::epilog(const std::string& text) {
  epilog_ = text;
  return *this;
}

bool ArgParser::parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    auto it = specs_.find(name);
    if (it == specs_.end())
      fail("[", command_, "] unknown flag '--", name, "'; see 'hetrain ", command_, " --help'");
    if (it->second.is_flag) {
      if (inline_value) fail("[", command_, "] flag '--", name, "' takes no value");
      values_[name] = "1";
    } else {
      if (!inline_value) {
        if (i + 1 >= args.size())
          fail("[", command_, "] flag '--", name, "' needs a value (", it->second.metavar, ")");
        value = args[++i];
      }
      values_[name] = value;
    }
  }
  if (given("help")) {
    std::cout << help();
    return false;
  }
  return true;
}

std::string ArgParser::help() const {
  std::ostringstream os;
  os << "usage: hetrain " << command_ << " [flags]\n\n" << summary_ << "\n\nflags:\n";
  for (const auto& name : order_) {
    const Spec& s = specs_.at(name);
    std::string left = "  --" + name + (s.is_flag ? "" : " " + s.metavar);
    os << left;
    if (left.size() < 28) {
      os << std::string(28 - left.size(), ' ');
    } else {
      os << "\n" << std::string(28, ' ');
    }
    os << s.help;
    if (s.def) os << " (default: " << *s.def << ")";
    os << "\n";
  }
  if (!epilog_.empty()) os << "\n" << epilog_ << "\n";
  return os.str();
}

bool ArgParser::given(const std::string& name) const { return values_.count(name) > 0; }

bool ArgParser::has(const std::string& name) const {
  if (given(name)) return true;
  auto it = specs_.find(name);
  return it != specs_.end() && it->second.def.has_value();
}

std::string ArgParser::get(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  auto it = specs_.find(name);
  if (it == specs_.end()) fail("[", command_, "] internal: undeclared flag --", name);
  if (!it->second.def) fail("[", command_, "] missing required flag --", name);
  return *it->second.def;
}

long long ArgParser::get_int(const std::string& name) const {
  std::string v = get(name);
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used != v.size()) throw std::invalid_argument(v);
    return x;
  } catch (const std::exception&) {
    fail("[", command_, "] --", name, " expects an integer, got '", v, "'");
  }
}

double ArgParser::get_double(const std::string& name) const {
  std::string v = get(name);
  try {
    size_t used = 0;
    double x = std::stod(v, &used);
    if (used != v.size() || !std::isfinite(x)) throw std::invalid_argument(v);
    return x;
  } catch (const std::exception&) {
    fail("[", command_, "] --", name, " expects a finite number, got '", v, "'");
  }
}

bool ArgParser::get_flag(const std::string& name) const { return given(name); }

}  // namespace hetrain::cli
