"""The models: the name encoder and its ONNX export, the recognizer's transformer layers and weights, the BNE
encoder, and the thread settings of torch and FAISS."""
