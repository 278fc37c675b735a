"""Blob storage for input and output images, behind one small Protocol.

``file`` keeps blobs under the data directory (the embedded default); ``database`` keeps
them in the ``blobs`` table, so every machine of a scaled-out deployment sees them;
``GENHOOK_BLOB_STORE=s3://bucket/prefix`` keeps them in an S3-compatible bucket
(``genhook.storage.s3``), and a directory there moves the files elsewhere.
"""

from genhook.storage.blobs import BlobStore, DatabaseBlobStore, FileBlobStore, open_blob_store

__all__ = ["BlobStore", "DatabaseBlobStore", "FileBlobStore", "open_blob_store"]
