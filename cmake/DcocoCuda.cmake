# dcoco_find_cuda(): whether the CUDA part can be configured, decided before enable_language(CUDA) because that
# one cannot fail softly. Sets in the caller's scope:
#   DCOCO_CUDA_FOUND       TRUE or FALSE
#   DCOCO_CUDA_WHY         why not, when FALSE
#   DCOCO_CUDA_ARCHS_USED  DCOCO_CUDA_ARCHS less the archs this nvcc cannot build
#   DCOCO_CUDA_DROPPED     those archs
#   DCOCO_NVCC, DCOCO_NVCC_VERSION, DCOCO_CUTLASS_DIR
#   DCOCO_NVCC_FROM_ENV    TRUE when CUDACXX named it (CMake then reads it, with its flags, itself)

# returns from dcoco_find_cuda() with the cause in its variable `why` (a variable, so no text is re-parsed)
macro(_dcoco_no_cuda)
  set(DCOCO_CUDA_WHY "${why}" PARENT_SCOPE)
  return()
endmacro()

function(dcoco_find_cuda)
  set(DCOCO_CUDA_FOUND FALSE PARENT_SCOPE)

  # the compiler, in CMake's order: CMAKE_CUDA_COMPILER, then CUDACXX, then nvcc on PATH or in CUDA_PATH
  set(from_env FALSE)
  if(CMAKE_CUDA_COMPILER)
    set(nvcc "${CMAKE_CUDA_COMPILER}")
    set(hint "CMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER} does not exist")
  elseif(NOT "$ENV{CUDACXX}" STREQUAL "")
    get_filename_component(nvcc "$ENV{CUDACXX}" PROGRAM PROGRAM_ARGS unused)
    set(from_env TRUE)
    set(hint "CUDACXX=$ENV{CUDACXX} does not exist")
  else()
    set(hints "")
    if(NOT "$ENV{CUDA_PATH}" STREQUAL "")
      set(hints "$ENV{CUDA_PATH}/bin")
    endif()
    # PATH only, not CMake's system prefixes: what the build backend looks at (it adds CUTLASS when it sees nvcc)
    find_program(nvcc nvcc HINTS ${hints} PATHS ENV PATH NO_DEFAULT_PATH NO_CACHE)
    set(hint "put nvcc on PATH or set CUDACXX")
  endif()
  if(NOT nvcc OR NOT EXISTS "${nvcc}")
    string(CONCAT why "nvcc was not found (${hint})")
    _dcoco_no_cuda()
  endif()

  execute_process(COMMAND "${nvcc}" --version RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 60)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "release ([0-9]+)\\.([0-9]+)")
    string(REGEX REPLACE "[ \t\r\n]+" " " err "${err}${out}")
    string(STRIP "${err}" err)
    string(CONCAT why "${nvcc} --version did not report a CUDA release (exit ${rc}: '${err}')")
    _dcoco_no_cuda()
  endif()
  set(ver "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
  if(ver VERSION_LESS 12.0)
    string(CONCAT why "nvcc ${ver} at ${nvcc} is older than 12.0, the oldest CUDA dcoco builds with")
    _dcoco_no_cuda()
  endif()

  # sm_100 and later (100a, 103a, 120, ...) need nvcc 12.8
  set(keep "")
  set(drop "")
  foreach(a IN LISTS DCOCO_CUDA_ARCHS)
    if(ver VERSION_LESS 12.8 AND a MATCHES "^([0-9]+)" AND CMAKE_MATCH_1 GREATER_EQUAL 100)
      list(APPEND drop "${a}")
    else()
      list(APPEND keep "${a}")
    endif()
  endforeach()
  if(NOT keep)
    string(CONCAT why "nvcc ${ver} can build none of DCOCO_CUDA_ARCHS (${DCOCO_CUDA_ARCHS})")
    _dcoco_no_cuda()
  endif()

  set(cutlass "${CUTLASS_INCLUDE_DIR}")
  if(NOT cutlass)
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -c
              "import importlib.util as u, os; s = u.find_spec('cutlass_library'); print(os.path.join(s.submodule_search_locations[0], 'source', 'include') if s else '')"
      OUTPUT_VARIABLE cutlass OUTPUT_STRIP_TRAILING_WHITESPACE)
  endif()
  if(NOT EXISTS "${cutlass}/cutlass/cutlass.h")
    string(CONCAT why "the CUTLASS headers were not found (got '${cutlass}'; pip install --no-deps "
                   "nvidia-cutlass==4.2.0.0, or pass -DCUTLASS_INCLUDE_DIR=<dir>)")
    _dcoco_no_cuda()
  endif()

  # a child CMake enables CUDA with this compiler and these archs; a success is remembered for reconfigures
  set(key "${nvcc}|$ENV{CUDACXX}|$ENV{CUDAFLAGS}|${ver}|${keep}|${CMAKE_CUDA_HOST_COMPILER}|${CMAKE_GENERATOR}")
  if(NOT DCOCO_CUDA_PROBED STREQUAL key)
    set(dir "${CMAKE_BINARY_DIR}/CMakeFiles/dcoco_cuda_probe")
    file(REMOVE_RECURSE "${dir}")
    set(opts "")
    if(NOT from_env)
      list(APPEND opts "-DCMAKE_CUDA_COMPILER=${nvcc}")
    endif()
    foreach(v IN ITEMS CMAKE_MAKE_PROGRAM CMAKE_TOOLCHAIN_FILE CMAKE_CUDA_HOST_COMPILER)
      if(${v})
        list(APPEND opts "-D${v}=${${v}}")
      endif()
    endforeach()
    message(CHECK_START "dcoco: checking that CMake can build CUDA with nvcc ${ver} for archs ${keep}")
    execute_process(COMMAND "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/cuda_probe" -B "${dir}"
                            -G "${CMAKE_GENERATOR}" ${opts} "-DCMAKE_CUDA_ARCHITECTURES=${keep}"
                    RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
    if(NOT rc EQUAL 0)
      message(CHECK_FAIL "no")
      file(WRITE "${dir}.log" "${log}")
      string(FIND "${log}" "CMake Error" at)
      if(at LESS 0)
        set(at 0)
      endif()
      string(SUBSTRING "${log}" ${at} -1 err)
      # the error's own words: not where it was raised, nor the call stack after it
      string(REGEX REPLACE "^CMake Error at [^\n]*\\(message\\):" "" err "${err}")
      string(REGEX REPLACE "(\nCall Stack|\n-- ).*" "" err "${err}")
      string(REGEX REPLACE "[ \t\r\n]+" " " err "${err}")
      if(log MATCHES "nvcc fatal *: *([^\n]*)")  # a failed test compile: nvcc's own line says why
        set(err "nvcc: ${CMAKE_MATCH_1}")
      endif()
      string(SUBSTRING "${err}" 0 400 err)
      string(STRIP "${err}" err)
      string(CONCAT why "CMake cannot build CUDA with nvcc ${ver} at ${nvcc} for archs ${keep}: ${err} "
                     "(the whole log: ${dir}.log)")
      _dcoco_no_cuda()
    endif()
    message(CHECK_PASS "yes")
    set(DCOCO_CUDA_PROBED "${key}" CACHE INTERNAL "the compiler and archs the CUDA check last passed with")
  endif()

  set(DCOCO_CUDA_FOUND TRUE PARENT_SCOPE)
  set(DCOCO_CUDA_ARCHS_USED "${keep}" PARENT_SCOPE)
  set(DCOCO_CUDA_DROPPED "${drop}" PARENT_SCOPE)
  set(DCOCO_NVCC "${nvcc}" PARENT_SCOPE)
  set(DCOCO_NVCC_VERSION "${ver}" PARENT_SCOPE)
  set(DCOCO_NVCC_FROM_ENV "${from_env}" PARENT_SCOPE)
  set(DCOCO_CUTLASS_DIR "${cutlass}" PARENT_SCOPE)
endfunction()
