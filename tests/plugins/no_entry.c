/* no_entry.so: a shared library that exports no steward_plugin_entry (only a misspelt one). */
#include <steward/policy.h>

STEWARD_PLUGIN_EXPORT int steward_plugin_entry_point(void) { return 0; }
