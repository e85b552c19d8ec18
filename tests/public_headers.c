/* The plugin header and the C API header in one C99 translation unit (issue 8 item 15): distinct
 * names for their status and finish enums. Compiled in the build (steward_header_check) and by
 * scripts/check_install.sh against the installed include directory. */
#include <steward/policy.h>
#include <steward/steward.h>

/* C99 has no _Static_assert: an array of negative size fails the compile instead. */
#define STEWARD_CHECK(name, cond) typedef char name[(cond) ? 1 : -1]

STEWARD_CHECK(check_status_ok, STEWARD_PLUGIN_OK == 0 && STEWARD_OK == 0);
STEWARD_CHECK(check_status_distinct, sizeof(steward_plugin_status) > 0 && sizeof(steward_status) > 0);
/* The same numbers for the same finish (distinct enum types: compared as int). */
STEWARD_CHECK(check_finish_numbers,
              (int)STEWARD_RESULT_STOP == (int)STEWARD_FINISH_STOP && (int)STEWARD_RESULT_LENGTH == (int)STEWARD_FINISH_LENGTH &&
                  (int)STEWARD_RESULT_CANCELLED == (int)STEWARD_FINISH_CANCELLED &&
                  (int)STEWARD_RESULT_TIMEOUT == (int)STEWARD_FINISH_TIMEOUT && (int)STEWARD_RESULT_ERROR == (int)STEWARD_FINISH_ERROR &&
                  (int)STEWARD_RESULT_OVERLOADED == (int)STEWARD_FINISH_OVERLOADED);
