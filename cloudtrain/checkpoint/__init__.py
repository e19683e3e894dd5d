"""The checkpoint component (node side, stdlib only, shipped): store, manifest, files, snapshots, parts,
download and copy."""
