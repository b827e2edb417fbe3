"""Triton: the model repository export (`cnclip export-triton`: export.py, the registry of the backends
it writes for in backends.py, graphs.py, and the Python-backend models onnx_model.py and
preprocess.py, copied into the repository as files) and the
launcher of the nvidia-pytriton wheel's tritonserver (`cnclip triton-server`: server.py). The remote
encoder that talks to a Triton server is runtime core (retrieval/remote.py, retrieval/triton_names.py)."""
