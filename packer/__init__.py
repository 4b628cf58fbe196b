"""packer: raw DICOM files and images → validated, leakage-free, versioned training shards."""

__version__ = "0.1.0"
