"""What runs on a node, inside the job: the node entry (entry.py) that the bootstrap's first stage
(entrypoints/bootstrap.py) hands over to once it has unpacked the bundle, the modules it runs from the bundle's lib/,
and what the workers load (sitecustomize, cloudtrain.runtime). Images may carry Python 3.8, so everything here runs
on it (the lint session checks with vermin). It imports nothing of cloudtrain but this
package, cloudtrain.storage, cloudtrain.contract (the names both sides share), cloudtrain.errors and cloudtrain._lazy
(an import-linter contract in pyproject.toml): client-side code (spec, plan, providers, CLI) is not shipped to nodes.
The client imports from here freely.
"""
