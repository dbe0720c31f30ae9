"""Ternary matmul kernels and the choice between them.

:mod:`.registry` holds the problem description, the ordered list of candidates
and :func:`~trit.kernels.registry.choose_kernel`; :mod:`.reference` is the
plain-PyTorch oracle, :mod:`.cpu` the CPU path, :mod:`.triton` the GPU kernels,
and :mod:`.tuning` the configs tuned per problem (``tuned/*.json``).
"""
