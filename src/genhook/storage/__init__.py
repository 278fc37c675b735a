"""Blob storage for input and output images, behind one small Protocol.

``file`` keeps blobs under the data directory (the embedded default); ``database`` keeps
them in the ``blobs`` table, so every machine of a scaled-out deployment sees them.
"""

from genhook.storage.blobs import BlobStore, DatabaseBlobStore, FileBlobStore, open_blob_store

__all__ = ["BlobStore", "DatabaseBlobStore", "FileBlobStore", "open_blob_store"]
