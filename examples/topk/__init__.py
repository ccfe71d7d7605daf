"""Top-k over chunks: a fan-out/fan-in example pipeline on scikit-learn's bundled digits."""
