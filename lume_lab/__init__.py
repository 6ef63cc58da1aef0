__version__ = "0.0.1"

import logging as _logging

# torchao (analysis.quantization's RTN) is imported by peft whenever it is installed. On a machine without CUDA it logs
# that its GPU kernels are missing, and torch logs that torchao's pytree registrations are deprecated; neither concerns
# lume_lab, and both would print in every process and notebook kernel. Errors still show.
for _name in ("torchao", "torch.utils._pytree"): _logging.getLogger(_name).setLevel(_logging.ERROR)
