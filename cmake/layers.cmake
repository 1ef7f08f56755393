# The layers of DESIGN.md, one target each, lowest first. A layer's sources compile against a
# view of the tree (symlinks under build/layers/<layer>/) that holds only its own headers and
# those of the layers below it, so an upward #include does not compile. The backends layer is
# two targets: `kernels`, graph-free, and `glue`, the eval_* files that bind primitives to the
# kernels and alone may see graph headers (they sit between graph and runtime). The objects
# of every layer below cli form the one static library hetrain_core: a primitive's vtable (in
# graph) names its eval_cpu (in glue) and a tensor's eval() (graph) is the runtime's, so the
# layers depend on each other at link time both ways; the direction is held at compile time.
set(HETRAIN_LAYERS base memory kernels graph glue runtime training distributed insight planning
    interop cli)

# Upward edges the code still has, each allowed here with why; removing one is the fix owed.
set(HETRAIN_LAYER_EXCEPTIONS
  # allocator.cpp and array.cpp reach CUDA memory and copies through backends/cuda/api.h;
  # owed: a device-memory interface in memory that the CUDA backend implements.
  "memory:kernels"
  # The trainer runs data parallelism over the communicator (training/data_parallel.cpp);
  # owed: DDP as a distributed-layer policy the trainer is handed.
  "training:distributed"
  # Checkpoints are safetensors files, and DESIGN.md puts safetensors in interop, above
  # training; owed: the format's reader and writer in a layer below training.
  "training:interop"
  # The device profile names catalog hardware and reads model specs (planning); owed: the
  # profile's hardware description in insight, the catalog reading it.
  "insight:planning")

# Header folders of a layer: its public folder under include/hetrain/ and its private one
# under src/ (where they exist).
function(hetrain_layer_dirs layer out_public out_private)
  set(pub ${layer})
  set(priv ${layer})
  if(layer STREQUAL "kernels")
    set(pub "")
    set(priv backends)
  elseif(layer STREQUAL "glue")
    set(pub "")
    set(priv "")
  endif()
  set(${out_public} ${pub} PARENT_SCOPE)
  set(${out_private} ${priv} PARENT_SCOPE)
endfunction()

# Makes build/layers/<layer>/{include,src} with links to the header folders `layer` may see.
function(hetrain_layer_view layer out_dir)
  set(view ${PROJECT_BINARY_DIR}/layers/${layer})
  file(REMOVE_RECURSE ${view})
  file(MAKE_DIRECTORY ${view}/include/hetrain ${view}/src)
  list(FIND HETRAIN_LAYERS ${layer} own)
  set(visible "")
  foreach(other IN LISTS HETRAIN_LAYERS)
    list(FIND HETRAIN_LAYERS ${other} rank)
    if(rank LESS_EQUAL own OR "${layer}:${other}" IN_LIST HETRAIN_LAYER_EXCEPTIONS)
      list(APPEND visible ${other})
    endif()
  endforeach()
  foreach(other IN LISTS visible)
    hetrain_layer_dirs(${other} pub priv)
    if(pub AND EXISTS ${PROJECT_SOURCE_DIR}/include/hetrain/${pub})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/hetrain/${pub} ${view}/include/hetrain/${pub}
           SYMBOLIC)
    endif()
    if(priv AND EXISTS ${PROJECT_SOURCE_DIR}/src/${priv})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${priv} ${view}/src/${priv} SYMBOLIC)
    endif()
  endforeach()
  set(${out_dir} ${view} PARENT_SCOPE)
endfunction()

# An object library of sources of `layer`, compiled against the layer's view.
function(hetrain_add_objects target layer)
  add_library(${target} OBJECT ${ARGN})
  hetrain_layer_view(${layer} view)
  target_include_directories(${target} PRIVATE ${view}/include ${view}/src)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${HETRAIN_WARNINGS}>)
  target_compile_definitions(${target} PUBLIC HETRAIN_VERSION="${PROJECT_VERSION}"
    HETRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  # Third-party headers (not layers): every layer may use them.
  target_link_libraries(${target} PRIVATE Threads::Threads nlohmann_json::nlohmann_json
    DNNL::dnnl PkgConfig::OPENBLAS ZLIB::ZLIB PkgConfig::TOMLPP onnx onnx_proto
    protobuf::libprotobuf)
  if(HETRAIN_WITH_CUDA)
    target_compile_definitions(${target} PUBLIC HETRAIN_HAVE_CUDA=1)
    target_link_libraries(${target} PRIVATE CUDA::cudart CUDA::cublasLt CUDA::cublas)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${HETRAIN_CUDA_FLAGS}>)
  endif()
endfunction()

function(hetrain_add_layer layer)
  hetrain_add_objects(hetrain_layer_${layer} ${layer} ${ARGN})
endfunction()
