"""What runs on the device: the two Triton kernels and their launchers (``kernel``),
the device functions they are built of (``device_functions``), the buffers they read and write
(``buffers``) and Triton's decorator, typed for mypy (``jit``).

Imported lazily: it needs torch (and triton for ``kernel``/``device_functions``), which a CPU
vLLM or a process with the feature off never loads.
"""
