"""Knowledge search: corpus readers, embeddings, FAISS indexes, the search service and the ``<search>`` tool."""
