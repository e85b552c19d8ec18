# StewardPlugin.cmake: steward_add_plugin(), the one way to build a Steward policy plugin.
#
#   steward_add_plugin(<target> [OUTPUT_NAME <name>] [OUTPUT_DIR <dir>] [SOURCES] <source>...)
#
# Builds <target> as a MODULE library (a dlopen-only shared object) named <name>.so (default
# <target>.so, no "lib" prefix) in <dir> (default: the usual output directory of the target), with
# hidden visibility for C and C++ (only steward_plugin_entry, marked STEWARD_PLUGIN_EXPORT, is
# exported), C11 for C sources and, with GCC on Linux, -Wl,--no-undefined so that a missing
# symbol fails the link rather than the dlopen. A C plugin links no C++ runtime.
#
# Where steward/policy.h comes from:
#   * installed Steward (find_package(steward)): steward-config.cmake defines the imported INTERFACE
#     target steward::policy before including this file; the plugin links it.
#   * in-tree (Steward's own build): no such target; the plugin gets STEWARD_POLICY_INCLUDE_DIR
#     (default: <this file's dir>/../include) as a private include directory.
# Both are resolved when steward_add_plugin() is called, so the include order does not matter.

if(NOT DEFINED STEWARD_POLICY_INCLUDE_DIR)
  set(STEWARD_POLICY_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../include")
endif()

function(steward_add_plugin target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "OUTPUT_NAME;OUTPUT_DIR" "SOURCES")
  set(sources ${ARG_SOURCES} ${ARG_UNPARSED_ARGUMENTS})
  if(NOT sources)
    message(FATAL_ERROR "steward_add_plugin(${target}): no sources given")
  endif()

  add_library(${target} MODULE ${sources})
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    C_STANDARD 11
    C_STANDARD_REQUIRED ON)
  if(ARG_OUTPUT_NAME)
    set_target_properties(${target} PROPERTIES OUTPUT_NAME ${ARG_OUTPUT_NAME})
  endif()
  if(ARG_OUTPUT_DIR)
    # $<1:...>: exactly this directory, also with multi-config generators (no per-config subdir).
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "$<1:${ARG_OUTPUT_DIR}>")
  endif()

  if(TARGET steward::policy)
    target_link_libraries(${target} PRIVATE steward::policy)
  else()
    target_include_directories(${target} PRIVATE ${STEWARD_POLICY_INCLUDE_DIR})
  endif()

  # GCC only: it links the sanitizer runtimes as shared libraries, so the check holds under
  # -fsanitize too (Clang links them statically into executables and would fail it).
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux" AND (CMAKE_C_COMPILER_ID STREQUAL "GNU" OR CMAKE_CXX_COMPILER_ID STREQUAL "GNU"))
    target_link_options(${target} PRIVATE "LINKER:--no-undefined")
  endif()
endfunction()
