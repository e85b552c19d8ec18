// Moved: the public header is runtime/api/steward/request.h.
#pragma once
#include <steward/request.h>
