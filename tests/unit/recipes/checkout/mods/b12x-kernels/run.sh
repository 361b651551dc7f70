#!/bin/bash
echo b12x-kernels
