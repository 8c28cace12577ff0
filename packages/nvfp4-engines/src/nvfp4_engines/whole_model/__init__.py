"""T6 for engines that run a whole model: llama.cpp and mlx-lm generating from nvfp4's
conversion of the T6 checkpoint, compared with the T6 reference tokens.

``python -m nvfp4_engines.whole_model ENGINE [--out reports/engines/whole-model]`` builds the
T6 model (:mod:`nvfp4_torch.smollm2`), converts it with nvfp4's converter to the
engine's format, runs the engine's own greedy generation for the golden prompts and writes
the comparison (:mod:`.results`): tokens matched, first divergences and the reference's
margin there, mean KL(reference || engine) and top-1 agreement teacher-forced on the
reference tokens. An engine is held to the reference tokens of the activation mode its
matmul computes in (:data:`.engines.ENGINES`): llama.cpp's ``ggml_mul_mat`` is W4A8 (int8
Q8_0 activations), mlx-lm's ``quantized_matmul`` W4A16.

Modules: :mod:`.compare` (the figures, numpy only), :mod:`.engines` (the runners; each
engine imported when opened), :mod:`.run` (the pipeline), :mod:`.results` (the document, its
schema and its Markdown). Needs the ``whole-model`` extra and the engine's; this package
imports none of its modules, so the engines matrix reads :mod:`.results` without them.
"""
