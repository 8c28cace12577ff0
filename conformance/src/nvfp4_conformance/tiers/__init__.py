"""The conformance tiers, collected with ``pytest --pyargs nvfp4_conformance.tiers``.

T0 codec, T1 planes and layouts, T2 activation quantization, T3 dequantization, T4 matmul,
T5 golden fixtures, T6 greedy parity (one module each, ``test_t<N>_*.py``).
"""
