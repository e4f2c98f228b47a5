"""Starting the ranks of a point (local processes, or srun inside a SLURM allocation) and judging the outcome."""
