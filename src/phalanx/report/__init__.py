"""What a failed job says: worker exits, their classification, OOM kills, the job-wide report."""
