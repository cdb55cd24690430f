"""The worker side of the process boundary: the process that runs one model's llama.cpp
(``python -m hearth.runner``). The server side is :mod:`hearth.fleet.process`."""
