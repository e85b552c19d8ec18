// Moved: the public header is runtime/api/steward/finish_reason.h.
#pragma once
#include <steward/finish_reason.h>
