#!/bin/bash
echo eagle3-loader
