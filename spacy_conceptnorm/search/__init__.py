"""Candidate search over the knowledge base's names: the sieve (exact, normalized, dense), the FAISS index, the
name-vector store and the rows that map vectors back to names and concepts."""
