"""Web search providers: ``bing``, ``brave``, ``replay`` and ``local``, each returning normalised `SearchResult`s."""
