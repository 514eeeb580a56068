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
# files cost four times as much apart as together. The files of one directory already belong
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
#   for instance) stay units of their own; a directory with one source is a unit of one.
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
# formats, the data sets: dltrain_base; the training loop: dltrain_train) and the programs
# built on it alone (dltrain-ps, dltrain-worker) keep the build type's optimisation (-O3 in
# Release). The control plane (dltrain_core: the leader, the agent, the HA gateway, the
# planner, the store; the client; the agent's program) handles a few messages a second per
# task: it is I/O-bound, and at -O3 it cost more than half of the build's CPU time, most of
# it GCC optimising the Asio/Beast operations and nlohmann::json code it instantiates.
#
# Only whole programs of the control plane get -O1, never a file of a data-plane program:
# an inline function (an Asio event loop, a LibTorch accessor) compiled in several units is
# kept once, from whichever unit the linker sees first, so an -O1 main would hand its
# copies to the hot code of the same program. dltrain-agent links dltrain_base too, but
# runs no data plane: its tasks are separate processes.
set(DLTRAIN_CONTROL_PLANE_OPTIMIZATION "-O1" CACHE STRING
    "Optimisation flag of the control plane (dltrain_core, the client, the agent) in Release builds: -O1 (the default), -O2, -O3, or empty for the build type's own")
if(NOT DLTRAIN_CONTROL_PLANE_OPTIMIZATION MATCHES "^(-O[0-3sg]|)$")
  message(FATAL_ERROR "DLTRAIN_CONTROL_PLANE_OPTIMIZATION: expected one of -O0, -O1, -O2, -O3, -Os, -Og or empty, got \"${DLTRAIN_CONTROL_PLANE_OPTIMIZATION}\"")
endif()

# dltrain_control_plane(TARGET...)
#   Compiles TARGETs with DLTRAIN_CONTROL_PLANE_OPTIMIZATION in Release builds; the flag
#   comes after the build type's, so it wins. Sanitizer builds keep their own -O1 (it comes
#   later still); Debug builds their -O0.
function(dltrain_control_plane)
  if(DLTRAIN_CONTROL_PLANE_OPTIMIZATION STREQUAL "")
    return()
  endif()
  foreach(target IN LISTS ARGN)
    target_compile_options(${target} PRIVATE "$<$<CONFIG:Release>:${DLTRAIN_CONTROL_PLANE_OPTIMIZATION}>")
  endforeach()
endfunction()
