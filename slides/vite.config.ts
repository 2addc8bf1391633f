import { defineConfig } from 'vite'

export default defineConfig({
  // The plots live in the repository's top-level assets/: serve and copy that folder as the
  // site root, so the deck writes <img src="/plot.png"> (works in build, dev and export).
  publicDir: '../assets',
  build: {
    // lightningcss rejects a nested rule UnoCSS emits for Slidev's code line numbers.
    cssMinify: false,
  },
})
