# StewardLayers.cmake: steward_layer(), one static library per folder, and the include views that
# make the layering a build error rather than a convention.
#
#   steward_layer(<name> [DIR <folder>] [SOURCES <src>...] [EXCLUDE <regex>]
#                 [PUBLIC <layer>...] [PRIVATE <layer>...])
#
# Builds steward_<name> from <folder>/*.cpp (default folder: runtime/<name>). Its headers are
# reachable as "<leaf>/x.h" (e.g. "kv/block_pool.h") through an include view in the build tree,
# layers/<name>/<leaf> -> <folder>, and only that view: a target sees the views of itself and of the
# layers it links (PUBLIC where its headers include them, PRIVATE where only its sources do). An
# include of a folder that is not below it fails to compile ("No such file"), so no folder can
# include upward and the folders cannot form a cycle. The public headers (<steward/...>, include/)
# are seen by every layer (steward_headers). tests/layers/ checks both.
function(steward_layer name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "DIR;EXCLUDE" "SOURCES;PUBLIC;PRIVATE")
  if(NOT ARG_DIR)
    set(ARG_DIR runtime/${name})
  endif()
  if(NOT ARG_SOURCES)
    file(GLOB ARG_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${ARG_DIR}/*.cpp)
  endif()
  if(ARG_EXCLUDE)
    list(FILTER ARG_SOURCES EXCLUDE REGEX "${ARG_EXCLUDE}")
  endif()
  steward_layer_view(${name} ${ARG_DIR} view)
  if(ARG_SOURCES)
    add_library(steward_${name} STATIC ${ARG_SOURCES})
    set(public PUBLIC)
    set(private PRIVATE)
  else()  # headers only (util/)
    add_library(steward_${name} INTERFACE)
    set(public INTERFACE)
    set(private INTERFACE)
  endif()
  target_include_directories(steward_${name} ${public} $<BUILD_INTERFACE:${view}>)
  target_link_libraries(steward_${name} ${public} steward_headers)
  foreach(dep ${ARG_PUBLIC})
    target_link_libraries(steward_${name} ${public} steward_${dep})
  endforeach()
  foreach(dep ${ARG_PRIVATE})
    target_link_libraries(steward_${name} ${private} steward_${dep})
  endforeach()
  set_property(GLOBAL APPEND PROPERTY STEWARD_LAYERS steward_${name})
endfunction()

# steward_layer_view(<name> <folder> <out var>): the include view layers/<name>/<leaf of folder>,
# a link to the folder; sets <out var> to the directory to put on the include path.
function(steward_layer_view name dir out)
  get_filename_component(leaf ${dir} NAME)
  set(view ${PROJECT_BINARY_DIR}/layers/${name})
  if(NOT IS_SYMLINK ${view}/${leaf})
    file(MAKE_DIRECTORY ${view})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${dir} ${view}/${leaf} SYMBOLIC)
  endif()
  set(${out} ${view} PARENT_SCOPE)
endfunction()
