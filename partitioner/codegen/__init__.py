"""Code generation: a plan becomes something that runs it.

``torch_module.py`` emits an ``nn.Module`` (the captured graph with explicit transfers, weights on
their devices, streamed weights prefetched); ``binding.py`` binds logical devices to present ones;
``prefetch.py`` is the run-time weight streamer.
"""
