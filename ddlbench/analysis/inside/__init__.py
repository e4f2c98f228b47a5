"""Inside an iteration, over a point's ranks: phase figures, overlap, gaps between updates, stragglers
(`figures`), and the point's timeline as a Chrome/Perfetto trace (`timeline`).

The ranks stamp their steps themselves (ddlbench.train.recording); this package only reads records, so it
stays free of torch like the rest of the analysis path.
"""
