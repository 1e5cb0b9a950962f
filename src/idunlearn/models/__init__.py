"""Identity-conditioned generators (Arc2Face and the mini Arc2Face) behind one interface."""
