from PIL import Image, ImageOps

from genhook.model import Input, Model


class Posterize(Model):
    def setup(self) -> None:
        self.calls = 0

    def predict(
        self, image: Image.Image, level: int = Input(2, ge=1, le=8, description="bits per channel")
    ) -> Image.Image:
        self.calls += 1
        return ImageOps.posterize(ImageOps.invert(image.convert("RGB")), level)
