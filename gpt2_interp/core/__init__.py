"""The neutral ground floor: result objects, progress bars, argument checks. Imports nothing of ours."""
