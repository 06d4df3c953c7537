// The table of py_function forward sites under XLA (xla_call.h): what a
// gradient custom call needs of its forward call, found by the id the forward
// lowering put in its tuple.
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "xla_call.h"

namespace pyfunc_bridge {

namespace {

struct SiteTable {
  std::mutex mu;
  std::deque<ForwardSite> sites;           // index = id; never shrinks
  std::map<std::string, int64_t> by_content;  // serialized site -> id
};

SiteTable& Sites() {
  static auto* table = new SiteTable;  // never destroyed: XLA programs may run at exit
  return *table;
}

std::string Serialize(const ForwardSite& s) {
  std::string out;
  for (const std::string* field :
       {&s.key, &s.reference, &s.pickled, &s.framework, &s.node}) {
    out += std::to_string(field->size()) + ":" + *field;
  }
  for (size_t i = 0; i < s.dtypes.size(); ++i) {
    out += std::to_string(s.dtypes[i].code) + "/" + std::to_string(s.dtypes[i].bits);
    for (int64_t d : s.dims[i]) out += "," + std::to_string(d);
    out += ";";
  }
  return out;
}

}  // namespace

int64_t RegisterForwardSite(ForwardSite site) {
  SiteTable& table = Sites();
  std::string content = Serialize(site);
  std::lock_guard<std::mutex> lock(table.mu);
  auto [it, added] = table.by_content.emplace(std::move(content),
                                              static_cast<int64_t>(table.sites.size()));
  if (added) table.sites.push_back(std::move(site));
  return it->second;
}

const ForwardSite* FindForwardSite(int64_t id) {
  SiteTable& table = Sites();
  std::lock_guard<std::mutex> lock(table.mu);
  if (id < 0 || id >= static_cast<int64_t>(table.sites.size())) return nullptr;
  return &table.sites[static_cast<size_t>(id)];  // deque: stable addresses
}

}  // namespace pyfunc_bridge
