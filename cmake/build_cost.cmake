# What the build spends, cut where it is spent (docs/benchmarks/build.md): unity builds by
# source directory, and the control plane compiled at -O1.
#
# Unity builds.
#
# Most of the build's CPU time is not in dltrain's own code but in what each translation
# unit instantiates again and again: LibTorch's headers and templates in every lib/train
# file (18-34 s each, 19 s of it at -O0), nlohmann::json in every leader and agent file,
# Beast's WebSocket stream in both the server and the client. Compiled as one unit per
# directory, each of those is parsed, instantiated and optimised once: lib/train's eight
# files cost 218 CPU-s apart and 47 s together. The files of one directory already belong
# together (they share headers and helpers), so grouping by directory keeps a group's
# failures local and its unit's size bounded.
#
# Off (-DDLTRAIN_UNITY_BUILD=OFF), every file is its own unit again: the faster choice
# while editing one file over and over, since a change recompiles its whole group.

option(DLTRAIN_UNITY_BUILD
       "Compile the sources of each directory of a target as one translation unit (faster cold builds; OFF compiles each file on its own)"
       ON)

# dltrain_unity_by_directory(TARGET)
#   Puts each C++ source of TARGET into the unity group of its directory (lib/leader,
#   lib/train, ...). Sources CMake cannot merge (those with their own COMPILE_OPTIONS,
#   for instance) stay units of their own; so do directories with one source.
#   Call it in the directory that created TARGET, after its sources are all added.
function(dltrain_unity_by_directory target)
  if(NOT DLTRAIN_UNITY_BUILD)
    return()
  endif()
  get_target_property(sources ${target} SOURCES)
  foreach(source IN LISTS sources)
    if(NOT source MATCHES "\\.(cpp|cc|cxx)$")
      continue()
    endif()
    get_filename_component(dir "${source}" DIRECTORY)
    if(dir STREQUAL "")
      set(dir "${target}")
    elseif(IS_ABSOLUTE "${dir}")
      # A generated source (build/generated/...): named by its own folder, not the path.
      get_filename_component(dir "${dir}" NAME)
    endif()
    # The group names the generated file (unity_<group>_cxx.cxx): no slashes.
    string(MAKE_C_IDENTIFIER "${dir}" group)
    set_source_files_properties(${source} PROPERTIES UNITY_GROUP "${group}")
  endforeach()
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
endfunction()

# The control plane at -O1.
#
# The code that runs per training step or per byte (the PS, the compressors, the wire
# formats, the data sets: dltrain_base; the training loop: dltrain_train) keeps the build
# type's optimisation (-O3 in Release). The control plane (the leader, the agent, the HA
# gateway, the client: dltrain_core and its programs, and the setup code of the PS's and the
# worker's main) handles a few messages a second per task: it is I/O-bound, and at -O3 it
# costs more than half of the build's CPU time, most of it GCC optimising the Asio/Beast
# operations and nlohmann::json code it instantiates. -O1 compiles it in two thirds of the
# time; bench/load measures the leader with it (docs/benchmarks/build.md).
set(DLTRAIN_CONTROL_PLANE_OPTIMIZATION "-O1" CACHE STRING
    "Optimisation flag of the control plane's code (the leader, agent, HA gateway, client) in Release builds: -O1 (the default), -O2, -O3, or empty for the build type's own")

# dltrain_control_plane(TARGET... SOURCES file...)
#   Compiles TARGETs (and the named SOURCES of this directory) with
#   DLTRAIN_CONTROL_PLANE_OPTIMIZATION in Release builds; the flag comes after the build
#   type's, so it wins. Sanitizer builds keep their own -O1; Debug builds their -O0.
function(dltrain_control_plane)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "SOURCES")
  if(DLTRAIN_CONTROL_PLANE_OPTIMIZATION STREQUAL "")
    return()
  endif()
  set(flag "$<$<CONFIG:Release>:${DLTRAIN_CONTROL_PLANE_OPTIMIZATION}>")
  foreach(target IN LISTS arg_UNPARSED_ARGUMENTS)
    target_compile_options(${target} PRIVATE ${flag})
  endforeach()
  if(arg_SOURCES)
    set_property(SOURCE ${arg_SOURCES} APPEND PROPERTY COMPILE_OPTIONS ${flag})
  endif()
endfunction()
