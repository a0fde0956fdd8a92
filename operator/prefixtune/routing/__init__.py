"""Cache-aware routing: the routers' facts (``policy``), and what derives from them."""
