# Unity builds by source directory (docs/benchmarks/build.md, "Unity builds").
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
    endif()
    # The group names the generated file (unity_<group>_cxx.cxx): no slashes.
    string(MAKE_C_IDENTIFIER "${dir}" group)
    set_source_files_properties(${source} PROPERTIES UNITY_GROUP "${group}")
  endforeach()
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
endfunction()
