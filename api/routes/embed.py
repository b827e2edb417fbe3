"""Raw embeddings, for clients that keep their own index."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Request, Response, UploadFile

from api.deps import EncoderDep, ReadAccess, SettingsDep, run_blocking
from api.disconnect import ClientGone, client_gone_response, while_connected
from api.guarded_route import GuardedRoute
from api.schemas import MAX_EMBED_IMAGES, EmbedResponse, EmbedTextRequest
from api.uploads import inspect_images, read_upload
from retrieval.errors import InvalidInput

router = APIRouter(prefix="/v1/embed", tags=["embed"], dependencies=[ReadAccess], route_class=GuardedRoute)


@router.post("/text", response_model=EmbedResponse)
async def embed_text(body: EmbedTextRequest, encoder: EncoderDep) -> EmbedResponse:
    """L2-normalised text vectors, one per text, in order."""
    vectors = await encoder.embed_texts(body.texts)
    return EmbedResponse(vectors=vectors.tolist(), model=encoder.model_id, dim=encoder.dim)


@router.post("/image", response_model=EmbedResponse)
async def embed_image(
    file: Annotated[list[UploadFile], File(description="One or more images (repeat the `file` field).")],
    encoder: EncoderDep,
    settings: SettingsDep,
    request: Request,
) -> EmbedResponse | Response:
    """L2-normalised image vectors, one per uploaded file, in order."""
    if len(file) > MAX_EMBED_IMAGES:
        raise InvalidInput(f"at most {MAX_EMBED_IMAGES} images per request; got {len(file)}")
    images = [await read_upload(upload, settings.max_image_bytes) for upload in file]
    await run_blocking(inspect_images, images, settings)  # each image, and all together, before any decoding
    try:
        vectors = await while_connected(request, encoder.embed_images(images))
    except ClientGone:
        return client_gone_response()
    return EmbedResponse(vectors=vectors.tolist(), model=encoder.model_id, dim=encoder.dim)
