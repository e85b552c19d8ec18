// Moved: the public header is runtime/api/steward/runtime.h.
#pragma once
#include <steward/runtime.h>
