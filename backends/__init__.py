"""Execution targets: where a placed graph runs.

Each backend (torch module emission per device kind, an onnxruntime runner, a
torch.distributed pipeline runner) lives in its own module here and declares which ops it
supports. Code generation arrives with the partitioner; until then device support is
declared by the profiles (``Device.supported_ops`` in ``cost_models/profiles.py``).
"""
