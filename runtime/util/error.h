// Moved: the public header is runtime/api/steward/expected.h. Kept only for runtime/cpu/ (backend.h,
// sampling.h), which still includes it; delete it once those include <steward/expected.h>.
#pragma once
#include <steward/expected.h>
