"""nvfp4-engines: thin adapters that let the nvfp4 conformance suite certify third-party NVFP4
implementations, each registered under the entry-point group ``nvfp4.backends``:

* ``gguf-py`` (:mod:`nvfp4_engines.gguf_py`) - the ``gguf`` package's ``gguf.quants``;
* ``mlx-native`` (:mod:`nvfp4_engines.mlx_native`) - MLX's ``mode="nvfp4"`` operations;
* ``ggml`` (:mod:`nvfp4_engines.ggml`) - ggml-cpu from llama-cpp-python's libggml;
* ``modelopt`` (:mod:`nvfp4_engines.modelopt`) - NVIDIA ModelOpt's ``NVFP4QTensor``;
* ``compressed-tensors`` (:mod:`nvfp4_engines.compressed_tensors`) - its NVFP4 compressor;
* ``torchao`` (:mod:`nvfp4_engines.torchao`) - torchao's ``NVFP4Tensor``;
* ``flashinfer``, ``vllm``, ``transformer-engine`` - GPU-only NVFP4 kernels
  (:mod:`nvfp4_engines.flashinfer`, :mod:`nvfp4_engines.vllm`,
  :mod:`nvfp4_engines.transformer_engine`): without a CUDA device they say "needs CUDA".

Each adapter calls only its engine's functions for the kernels the engine has; what it
lacks is absent. Importing this package or calling a factory imports no engine;
``availability()`` says what to install when one is missing. :mod:`nvfp4_engines.matrix`
turns the certificates into ``docs/engines.md``; :mod:`nvfp4_engines.whole_model` runs T6
on engines that run a whole model (llama.cpp, mlx-lm) and adds their results there.
"""

from ._version import __version__

__all__ = ["ADAPTERS", "GPU_ONLY", "__version__"]

#: Adapter name -> the module holding its ``backend`` factory.
ADAPTERS = {
    "gguf-py": "nvfp4_engines.gguf_py",
    "mlx-native": "nvfp4_engines.mlx_native",
    "ggml": "nvfp4_engines.ggml",
    "modelopt": "nvfp4_engines.modelopt",
    "compressed-tensors": "nvfp4_engines.compressed_tensors",
    "torchao": "nvfp4_engines.torchao",
    "flashinfer": "nvfp4_engines.flashinfer",
    "vllm": "nvfp4_engines.vllm",
    "transformer-engine": "nvfp4_engines.transformer_engine",
}

#: The adapters whose engine runs on NVIDIA GPUs only.
GPU_ONLY = ("flashinfer", "vllm", "transformer-engine")
