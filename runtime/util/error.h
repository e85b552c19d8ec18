// Moved: the public header is runtime/api/steward/expected.h.
#pragma once
#include <steward/expected.h>
