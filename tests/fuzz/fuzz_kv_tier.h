// The identity the KV tier file fuzz target checks files against, shared with make_seeds.cpp so the
// checked-in seeds are valid files of it (and the fuzzer starts past every check).
#pragma once
#include "kv/kv_tier.h"

namespace steward_fuzz {

inline const steward::KvTierIdentity k_kv_tier_identity{0x1a70f00dcafe0001ull, 0x5a175a175a170002ull, 64};

}  // namespace steward_fuzz
