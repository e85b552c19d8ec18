/* Moved: the public header is runtime/api/steward/steward.h (found next to this file, so that a
 * translation unit with only runtime/ on its include path, as tests/plugins/decline_eviction.c, still builds). */
#include "steward/steward.h"
