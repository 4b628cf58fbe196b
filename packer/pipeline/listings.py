"""Where a run's messages say its lists are: the audit's findings, the bad samples and the files
left out on purpose. A build writes them as files beside its versions (:data:`BUILD_LISTINGS`);
``packer validate`` writes none of them, they are parts of its report (:data:`VALIDATE_LISTINGS`).
The stages hand one of the two to every step whose warning points at a list
(:func:`packer.pipeline.stages.run_stages`), so that validate never sends the user to a file it
did not write."""
from __future__ import annotations

from dataclasses import dataclass

from packer.badsamples import REPORT_FILE
from packer.exclusions import EXCLUDED_FILE

#: The audit's findings of a build (``packer.pipeline.audit.write_leakage``)
LEAKAGE_FILE = "leakage.json"


@dataclass(frozen=True)
class Listings:
    """Where the run's messages say its lists are: the audit's findings (``audit``), the bad
    samples (``bad``) and the files left out on purpose (``excluded``). A build writes them as
    files beside its versions (:data:`BUILD_LISTINGS`); ``packer validate`` writes none of them,
    they are parts of its report (``--json``, ``ValidationResult.report``: :data:`VALIDATE_LISTINGS`)."""

    audit: str
    bad: str
    excluded: str


BUILD_LISTINGS = Listings(audit=LEAKAGE_FILE, bad=REPORT_FILE, excluded=EXCLUDED_FILE)
# named alike for the command and the Python call, so that the two reports are one document
VALIDATE_LISTINGS = Listings(audit="the validate report's audit", bad="the validate report's bad_samples.records",
                             excluded="the validate report's excluded.records")
