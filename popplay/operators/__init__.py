"""Population operators over batched arrays: sharing and differentiation
(:mod:`~popplay.operators.sharing`), selective replication with variation and its
lineage (:mod:`~popplay.operators.evolution`)."""
