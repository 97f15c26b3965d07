# SPDX-License-Identifier: MIT
# Every worked value in the public headers' doc comments is computed by a test: this script
# fails when one ("{-2, 3} -> {2, 3}", "(3, 4) -> 5", ": [6, 6, 6, 6]", "// {6, 6, 6, 6}", ...)
# is not quoted, word for word, in a test source, where a CHECK computes it.
#   cmake -DSOURCE_DIR=<namedax> -P tests/doc_comments.cmake
file(GLOB headers "${SOURCE_DIR}/include/namedax/*.hpp")
file(GLOB sources "${SOURCE_DIR}/tests/*.cpp")
set(tests "")
foreach(source IN LISTS sources)
  file(READ "${source}" text)
  string(APPEND tests "${text}")
endforeach()
set(patterns
    "\\{[^}]*\\} -> \\{[^}]*\\}"                 # {in} -> {out}
    "\\([^)]*\\) -> [0-9][0-9a-z /]*[0-9a-z]"     # (x, y) -> value
    "\\[[0-9., ]*\\] -> \\[[0-9., ]*\\]"           # [in] -> [out]
    ": \\[[0-9, ]*\\]"                            # With x = ...: [out]
    "  // \\{[^}]*\\}"                            # code  // {out}
    "  // \\[[a-z0-9, ]*\\]")                     # code  // [out]
set(found 0)
set(missing "")
foreach(header IN LISTS headers)
  file(READ "${header}" text)
  string(REPLACE ";" "," text "${text}")  # a list separator for CMake
  string(REPLACE "[" "@LB@" text "${text}")  # brackets group list elements: compared as @LB@ @RB@
  string(REPLACE "]" "@RB@" text "${text}")
  string(REGEX MATCHALL "///[^\n]*" comments "${text}")
  foreach(comment IN LISTS comments)
    foreach(pattern IN LISTS patterns)
      string(REPLACE "\\[" "@LB@" pattern "${pattern}")
      string(REPLACE "\\]" "@RB@" pattern "${pattern}")
      string(REGEX MATCHALL "${pattern}" values "${comment}")
      foreach(value IN LISTS values)
        math(EXPR found "${found} + 1")
        string(REPLACE "@LB@" "[" quoted "${value}")
        string(REPLACE "@RB@" "]" quoted "${quoted}")
        string(FIND "${tests}" "${quoted}" at)
        if(at EQUAL -1)
          get_filename_component(name "${header}" NAME)
          string(APPEND missing "\n  ${name}: ${quoted}")
        endif()
      endforeach()
    endforeach()
  endforeach()
endforeach()
if(missing)
  message(FATAL_ERROR "worked values in doc comments that no test quotes (add a CHECK that computes each):${missing}")
endif()
if(found LESS 30)
  message(FATAL_ERROR "only ${found} worked values found in the headers' doc comments: the patterns no longer read them")
endif()
message(STATUS "${found} worked values in the headers' doc comments, each quoted by a test")
