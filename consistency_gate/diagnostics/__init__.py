"""Why an ensemble helps or not: pairwise and team diversity, loss decomposition, team selection, diagnose."""
